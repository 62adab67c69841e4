"""The tools in use (tests/test_tools.py runs each), run from the repository root as `python -m scripts.NAME`."""
