"""Writing the one file a user names: whole or not at all, with the permissions a new file of theirs gets."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from ..model.errors import ProfileError, shown_path


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` (readers never see half a file), on any
    error it is removed. mkstemp creates 0600 files: the result gets 0666 minus the umask, like any file the user
    writes."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        yield Path(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except OSError as exc:
        raise ProfileError(f"cannot write {shown_path(path)}: {exc.strerror or exc}. Check the folder, its permissions "
                           "and free space.") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
