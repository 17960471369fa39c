"""Directory blobs and outputs read from a work dir the task controls: reproducible
tars; links, hard links and special files refused; extraction stays under its target."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from populi_p2p.artifacts.files import OutputError, extract_tar, open_output, pack_dir


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("a")
    (root / "b.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "b.sh", 0o700)
    return root


def test_a_directory_packs_to_the_same_bytes_and_unpacks_whole(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    pack_dir(src, tmp_path / "one.tar")
    os.utime(src / "sub" / "a.txt", (1, 1))  # times and owners are not in the tar
    pack_dir(src, tmp_path / "two.tar")
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    extract_tar(tmp_path / "one.tar", tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "a.txt").read_text() == "a"
    assert os.stat(tmp_path / "out" / "b.sh").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "out" / "sub" / "a.txt").st_mode & 0o777 == 0o644


def test_an_output_through_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("the daemon's")
    (work / "link").symlink_to(secret)
    (work / "dirlink").symlink_to(tmp_path)
    os.link(secret, work / "hard")
    (work / "d").mkdir()
    (work / "d" / "inner").symlink_to(secret)
    for path, why in (("link", "symbolic link"), ("dirlink/secret", "symbolic link"),
                      ("hard", "hard links"), ("missing", "does not exist"),
                      ("d", "symbolic link")):  # fmt: skip
        with pytest.raises(OutputError, match=why), open_output(work, path, tmp_path / "t.tar"):
            pass
    (work / "ok.txt").write_text("mine")
    with open_output(work, "ok.txt", tmp_path / "t.tar") as (source, unpack):
        assert source.read_text() == "mine" and not unpack


def _tar_with(tmp: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    path = tmp / "evil.tar"
    with tarfile.open(path, "w") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return path


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("../escape"),
        (lambda i: (setattr(i, "type", tarfile.SYMTYPE), setattr(i, "linkname", "/etc"), i)[-1])(
            tarfile.TarInfo("link")
        ),
        (lambda i: (setattr(i, "type", tarfile.CHRTYPE), i)[-1])(tarfile.TarInfo("dev")),
    ],
)
def test_extraction_refuses_what_leaves_the_target_or_is_not_a_file(
    tmp_path: Path, member: tarfile.TarInfo
) -> None:
    evil = _tar_with(tmp_path, member)
    with pytest.raises(OutputError):
        extract_tar(evil, tmp_path / "out")
    assert not (tmp_path / "escape").exists()
