import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (Mininet): run as root, or deselect knowingly with -m 'not mininet'")
    for item in items:
        if "mininet" in item.keywords:
            item.add_marker(skip)
