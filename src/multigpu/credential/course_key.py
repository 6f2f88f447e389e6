"""The course's signing key: an Ed25519 key pair made by :func:`keygen` (``multigpu keygen``), the
private key OUTSIDE the repository (:func:`default_key_path`: ``$MULTIGPU_COURSE_KEY`` or
``~/.config/multigpu/course-key``, mode 600), the public key beside it as ``<key>.pub``
(``ed25519 <base64>``), the only part that is shared."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from multigpu.core import layout
from multigpu.grading import rules


def default_key_path() -> Path:
    """``$MULTIGPU_COURSE_KEY``, else ``~/.config/multigpu/course-key`` (outside the repository)."""
    return rules.course_key_path()


def public_key_path(private: str | os.PathLike) -> Path:
    private = Path(private)
    return private.with_name(private.name + ".pub")


def public_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519 " + base64.b64encode(raw).decode()


def keygen(path: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Create the course's signing key at ``path`` (mode 600) and ``path.pub``; returns both.

    Refuses a path inside the repository (a key committed by mistake signs anything) and an
    existing key (overwriting it would invalidate every certificate issued with it).
    """
    private = Path(path).expanduser() if path else default_key_path()
    resolved, course = private.resolve(), layout.course_root()
    if resolved == course or course in resolved.parents:
        raise ValueError(f"{private} is inside the course repository: keep the private key outside it "
                         f"(default {default_key_path()})")
    if private.exists():
        raise FileExistsError(f"{private} exists: a new key would invalidate every certificate signed with it")
    private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = public_key_path(private)
    public.write_text(public_text(key.public_key()) + "\n")
    return private, public


def load_private_key(path: str | os.PathLike | None = None) -> Ed25519PrivateKey:
    path = Path(path).expanduser() if path else default_key_path()
    if not path.exists():
        raise FileNotFoundError(f"no course key at {path}: create one with 'multigpu keygen'")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path_or_text: str | os.PathLike) -> Ed25519PublicKey:
    """A public key from a ``.pub`` file or its text ``ed25519 <base64>``."""
    text = str(path_or_text)
    if not text.startswith("ed25519 "):
        text = Path(path_or_text).read_text().strip()
    kind, _, b64 = text.partition(" ")
    if kind != "ed25519":
        raise ValueError("a public key looks like 'ed25519 <base64>'")
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(b64))
