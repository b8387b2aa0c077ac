"""An optional GPU library that is installed but does not import, as the kernel tests stage it."""
import logging
import sys
from contextlib import contextmanager


@contextmanager
def broken_install(monkeypatch, caplog, module: str, distribution: str, is_installed: bool, cached_import):
    """`import module...` fails (ModuleNotFoundError), also where the real library was imported before, while
    `distribution` reads as installed (or not), and `cached_import` (the kernel module's cached import function)
    forgets its answer before and after; yields the messages `cosmos3_kernels.optional` logs inside the block, filled at
    its end."""
    from cosmos3_kernels import optional

    # The package and every submodule already imported (an earlier GPU test's real import): a None entry makes
    # `import` raise for that exact name, and an imported submodule would otherwise still be found.
    for name in {module} | {name for name in sys.modules if name.startswith(module + ".")}:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(optional, "installed", lambda name: is_installed and name == distribution)
    messages = []
    cached_import.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="cosmos3_kernels.optional"):
            yield messages
    finally:
        cached_import.cache_clear()
    messages.extend(r.getMessage() for r in caplog.records if r.name == "cosmos3_kernels.optional")


def assert_repair_warning(messages, distribution: str, is_installed: bool, *fragments: str) -> None:
    """One warning naming the import error and each fragment where the library is installed; none where it is not."""
    if not is_installed:
        assert messages == []
        return
    [message] = messages
    assert message.startswith(f"{distribution} is installed but does not import (ModuleNotFoundError")
    assert "requirements-gpu.txt" in message and all(fragment in message for fragment in fragments)
