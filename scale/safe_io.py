"""I/O errors during a run as one `error:` line instead of a traceback: what could not be written (the path),
why (a full disk is said as such) and that everything written before stays. The run then stops cleanly
(SystemExit runs every `finally`: env workers, engine and the run lock are released) and continues with
--resume.

- `stop_on_io_error(path)`: a block whose OSError becomes that line (metrics, archive, `latest`, log
  repair).
- `append_line(path, line)`: one row appended to a JSONL log under that guard (a torn row is repaired on
  resume).
- `out_of_space(e, folder)`: whether a failed write ran out of space (also through wrapped library errors).
"""

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path


def out_of_space(e: BaseException, folder: Path) -> bool:
    """ENOSPC anywhere in the exception chain, its text in a wrapped error (safetensors, tokenizers), or a
    folder with (almost) no free space left after a write failed (torch's own writer reports only 'iostream
    error')."""
    while e is not None:
        said = any(s in str(e) for s in ("No space left", "os error 28"))
        if getattr(e, "errno", None) == errno.ENOSPC or said:
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(folder).free < 2**20
    except OSError:
        return False


def io_error_line(path: Path, e: BaseException) -> str:
    """One line naming the file (the error's own, else `path`) and the cause; nothing before it is lost."""
    where = Path(getattr(e, "filename", None) or path)
    if out_of_space(e, where.parent):
        cause = "no space left on device"
    else:
        cause = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return (f"error: could not write {where}: {cause}; everything written before it is kept: free space "
            f"(or fix the folder), then continue the run with --resume")


@contextmanager
def stop_on_io_error(path: Path):
    """Turn an OSError of the block into one error line naming `path` (or the file the error names)."""
    try:
        yield
    except OSError as e:
        raise SystemExit(io_error_line(path, e)) from None


def append_line(path: Path, line: str) -> None:
    """Append one row (a JSONL log); a failed write is one error line, and the rows before it stay."""
    with stop_on_io_error(path), open(path, "a") as f:
        f.write(line + "\n")
