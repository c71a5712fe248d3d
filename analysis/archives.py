"""Records kept packed: a result folder's raw files (each run's config and metrics, evaluations, logs) live in
one archive beside it, bench/results/X.tar.gz holding X/..., and a reader names the same paths as before. A
path that is not on disk is read from an archive of one of its parent folders whose name begins the path's
next part and that holds it under its path relative to that folder (bench/results/X/run/metrics.jsonl: member
X/run/metrics.jsonl of bench/results/X.tar.gz), so `tar xzf bench/results/X.tar.gz -C bench/results` puts
the files back where they were.

    python analysis/archives.py list bench/results/learn_sweep_v21.tar.gz          # its members
    python analysis/archives.py pack bench/results/step.tar.gz bench/results/step  # pack files or folders
                                                                     # (their files leave the disk)
An archive is written deterministically (sorted members, no times or owners), so packing the same files
again gives the same bytes.
"""
import argparse
import functools
import gzip
import io
import os
import sys
import tarfile
from pathlib import Path


@functools.lru_cache(maxsize=16)
def _members(archive: Path, stamp: tuple[int, int]) -> dict[str, bytes]:
    """Every member of an archive by its name (`stamp`, the file's mtime and size, renews the cache)."""
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def members(archive: Path | str) -> dict[str, bytes]:
    """Every member of an archive by its name, read once while the file is unchanged."""
    st = Path(archive).stat()
    return _members(Path(archive).absolute(), (st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=256)
def _archives(folder: Path, stamp: int) -> tuple[Path, ...]:
    """The archives in a folder (`stamp`, the folder's mtime, renews the cache)."""
    return tuple(sorted(folder.glob("*.tar.gz")))


def _names_it(archive: Path, part: str) -> bool:
    """Whether an archive's name (less .tar.gz) begins `part`, the next part of a path below its folder:
    learn_sweep_v21.tar.gz for learn_sweep_v21/..., intervention.tar.gz for
    intervention_smollm2_official.json."""
    stem = archive.name[:-len(".tar.gz")]
    return part == stem or part.startswith((stem + "_", stem + "."))


def _naming(path: Path | str):
    """(archive, `path` relative to its folder) of each archive in a parent folder of `path` whose name
    begins the path's next part, nearest folder first."""
    path = Path(path).absolute()
    for folder in (f for f in path.parents if f.is_dir()):
        rel = path.relative_to(folder).as_posix()
        for archive in _archives(folder, folder.stat().st_mtime_ns):
            if _names_it(archive, rel.split("/")[0]):
                yield archive, rel


def _holder(path: Path | str) -> tuple[Path, str] | None:
    """(archive, member name) of a packed `path`: the nearest parent folder's archive that names it and holds
    it under its path relative to that folder; None if none does."""
    return next(((a, rel) for a, rel in _naming(path) if rel in members(a)), None)


def exists(path: Path | str) -> bool:
    """A file on disk, or one packed in an archive of its parent folders."""
    return Path(path).is_file() or _holder(path) is not None


def read_bytes(path: Path | str) -> bytes:
    """The file on disk, else its packed member."""
    if Path(path).is_file():
        return Path(path).read_bytes()
    held = _holder(path)
    if held is None:
        raise FileNotFoundError(f"{path}: not on disk and in no archive of its folders")
    return members(held[0])[held[1]]


def read_text(path: Path | str) -> str:
    return read_bytes(path).decode("utf-8")


def listing(folder: Path | str) -> list[str]:
    """The files under `folder`, on disk and packed (in the archives `_holder` would read them from), as paths
    relative to it."""
    folder = Path(folder).absolute()
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    for archive, rel in _naming(folder):
        names.update(n[len(rel) + 1:] for n in members(archive) if n.startswith(rel + "/"))
    return sorted(names)


def write_text(path: Path | str, text: str) -> None:
    """Write `path` where it lives: on disk, or, where a record keeps it packed, as its archive's member (the
    archive rewritten only if the text changed), so rewriting a packed record leaves it packed."""
    path, data = Path(path), text.encode("utf-8")
    held = None if path.is_file() else _holder(path)
    if held is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    elif members(held[0])[held[1]] != data:
        write_archive(held[0], {**members(held[0]), held[1]: data})


def write_archive(archive: Path, files: dict[str, bytes]) -> None:
    """A .tar.gz of `files` (member name -> bytes) in name order, times 0, owner root, mode 644."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    tmp = Path(archive).with_name(Path(archive).name + ".tmp")
    with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    os.replace(tmp, archive)  # whole or not at all


def pack(archive: Path, paths: list[Path]) -> list[str]:
    """Add files (folders: every file under them) to `archive`, named relative to its folder, keeping the
    members it already has (a file given again replaces its member), then remove them from the disk.
    Returns the names added."""
    archive, base = Path(archive), Path(archive).absolute().parent
    files = dict(members(archive)) if archive.exists() else {}
    given = [f for p in map(Path, paths) for f in (sorted(p.rglob("*")) if p.is_dir() else [p])
             if f.is_file()]
    added = {f.absolute().relative_to(base).as_posix(): f for f in given}
    unnamed = [n for n in added if not _names_it(archive, n.split("/")[0])]
    if unnamed:
        raise SystemExit(f"error: {archive.name} would hold {unnamed[0]}, which no reader would look for "
                         "there: an archive's name begins the paths it holds")
    files.update({name: f.read_bytes() for name, f in added.items()})
    write_archive(archive, files)
    for f in added.values():
        f.unlink()
    for p in (Path(p) for p in paths if Path(p).is_dir()):  # folders left empty go too
        for d in sorted([p, *(d for d in p.rglob("*") if d.is_dir())], key=lambda d: -len(d.parts)):
            if not any(d.iterdir()):
                d.rmdir()
    return sorted(added)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list").add_argument("archive", type=Path)
    p = sub.add_parser("pack")
    p.add_argument("archive", type=Path)
    p.add_argument("paths", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, data in sorted(members(args.archive).items()):
            print(f"{len(data):>10}  {name}")
    else:
        print(f"{args.archive}: {len(pack(args.archive, args.paths))} files added", file=sys.stderr)


if __name__ == "__main__":
    main()
