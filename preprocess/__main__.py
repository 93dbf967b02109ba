"""`python -m preprocess`: see preprocess/pipeline.py."""

from preprocess.pipeline import main

if __name__ == "__main__":
    main()
