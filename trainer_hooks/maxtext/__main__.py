"""``python -m trainer_hooks.maxtext <MaxText arguments>``."""

from trainer_hooks.maxtext.hook import main

if __name__ == "__main__":
    main()
