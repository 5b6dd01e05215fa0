"""The table of chapter times at the end of a test session that executed chapters (reported, never enforced)."""

import pytest

_records_key = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def chapter_records(request) -> list:
    """The run records of the chapters this session executed; their time table ends the session's report."""
    return request.config.stash.setdefault(_records_key, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    records = config.stash.get(_records_key, None)
    if not records:
        return
    from book.tools.run_notebooks import time_table

    terminalreporter.section("chapter times against their targets (reported, not enforced)")
    for line in time_table(records).splitlines():
        terminalreporter.write_line(line)
