"""`python -m preprocess.inspect`: see preprocess/inspect/contact_sheet.py."""

import sys

from preprocess.inspect.contact_sheet import main

if __name__ == "__main__":
    sys.exit(main())
