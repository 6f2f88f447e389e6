"""The grading service's ngshare client without a hub: where a submission's files may land and
when the service uses ngshare at all. tests/test_workshop_k8s.py runs it against a real ngshare
behind a real hub (make test-hub)."""

from __future__ import annotations

import base64

import pytest

from multigpu.workshop import layout, ngshare


def _file(path: str, data: bytes) -> dict[str, str]:
    return {"path": path, "content": base64.encodebytes(data).decode()}  # ngshare's own encoding, with newlines


def test_a_submissions_files_are_written_inside_its_folder_and_a_stored_result_is_left_out(tmp_path):
    big = bytes(range(256)) * 40  # several of encodebytes' 76-character lines
    files = [_file("00-welcome.ipynb", b"{}"), _file("data/images.bin", big), _file("grading-result.json", b"forged"),
             _file("timestamp.txt", b"1999-01-01"), _file(".ipynb_checkpoints/00-welcome-checkpoint.ipynb", b"{}")]
    written = ngshare.write_files(tmp_path / "sub", files,
                                  skip=("grading-result.json", layout.STAMP_FILE, ".ipynb_checkpoints"))
    assert sorted(p.relative_to(tmp_path / "sub").as_posix() for p in written) == ["00-welcome.ipynb", "data/images.bin"]
    assert (tmp_path / "sub/data/images.bin").read_bytes() == big
    assert not (tmp_path / "sub/grading-result.json").exists() and not (tmp_path / "sub/timestamp.txt").exists()


@pytest.mark.parametrize("path", ["../escape.ipynb", "/etc/passwd", "a/../../b", "", "a\\..\\b", "./../x"])
def test_a_path_that_leaves_the_folder_refuses_the_whole_submission(path, tmp_path):
    files = [_file("00-welcome.ipynb", b"{}"), _file(path, b"x")]
    with pytest.raises(ngshare.NgshareError, match="refused"):
        ngshare.write_files(tmp_path / "sub", files)
    assert not (tmp_path / "sub").exists(), "nothing is written before every path is checked"
    assert not (tmp_path / "escape.ipynb").exists()


def test_the_service_uses_ngshare_only_where_its_address_is_set(monkeypatch):
    monkeypatch.delenv(ngshare.URL_VAR, raising=False)
    assert ngshare.Ngshare.from_env() is None
    monkeypatch.setenv(ngshare.URL_VAR, "http://ngshare:8080/services/ngshare/")
    monkeypatch.delenv(ngshare.TOKEN_VAR, raising=False)
    with pytest.raises(ngshare.NgshareError, match="no token"):
        ngshare.Ngshare.from_env()
    monkeypatch.setenv(ngshare.TOKEN_VAR, "secret")
    client = ngshare.Ngshare.from_env()
    assert client is not None and client.url == "http://ngshare:8080/services/ngshare" and client.token == "secret"


def test_a_submission_is_queued_under_the_file_exchanges_name_form():
    sub = ngshare.Submission("alice", "lab-00", "2026-11-26 02:30:00.123456 UTC")
    assert sub.name == "alice+lab-00+2026-11-26 02:30:00.123456 UTC"


def test_an_unreachable_ngshare_is_an_error_with_its_address():
    client = ngshare.Ngshare("http://127.0.0.1:9", "t", timeout_s=5)  # port 9: discard, nothing listens
    with pytest.raises(ngshare.NgshareError, match="cannot be reached"):
        client.assignments()


def test_only_names_that_can_be_a_courses_folder_are_read():
    for ok in ("alice", "learner01", "ada.lovelace@uni.edu", "lab-00", "assessment", "x.."):
        assert ngshare.NAME.fullmatch(ok), ok
    for bad in ("..", "../alice", "a/b", ".hidden", "-rf", "", "a b", "a\nb", "x" * 101):
        assert not ngshare.NAME.fullmatch(bad), bad
