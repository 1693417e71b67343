"""A module that fails to import, for the trial-runtime error tests."""

raise ImportError("needs a package that is not installed: fancy_dataset")
