"""``python -m ragdb.cli``: the ``ragdb`` command."""

from ragdb.cli.main import main

if __name__ == "__main__":
    main()
