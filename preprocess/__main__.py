"""`python -m preprocess`: see preprocess/launch/command.py (the command) and preprocess/pipeline.py (the job)."""

from preprocess.launch.command import main
from preprocess.launch.process_exit import exit_without_teardown

if __name__ == "__main__":
    main()
    exit_without_teardown(0)
