import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "maxtext: runs the real MaxText (the .venv-maxtext venv) on the CPU under an in-process sidecar",
    )
