"""``multigpu keygen | certify | verify | revoke | publish-issuer``: the course's certificates.

    multigpu keygen [--key PATH]        the course's signing key, outside the repository
    multigpu certify                    certificates for who passed (after make autograde)
    multigpu verify CERT --public-key course-key.pub [--status-list status-list.jwt]
    multigpu revoke ID --reason WHY     withdraw a certificate (the course's status list)
    multigpu publish-issuer DIR         the files the course hosts: issuer profile, key, status list, page
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_keygen(args: argparse.Namespace) -> int:
    from multigpu.credential import certificates

    try:
        private, public = certificates.keygen(args.key)
    except (FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"private key: {private} (keep it secret; back it up)\npublic key:  {public} (publish it with the course)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from multigpu.credential import certificates

    public = args.public_key or certificates.public_key_path(certificates.default_key_path())
    if not Path(args.certificate).exists():
        print(f"error: no certificate at {args.certificate}", file=sys.stderr)
        return 2
    if not str(public).startswith("ed25519 ") and not Path(public).is_file():
        print(f"error: no public key at {public}: pass the course's published key, --public-key course-key.pub "
              "(a workshop hub publishes it at <hub address>/services/grading/issuer/course-key.pub; on the hub's "
              f"box it lies beside the signing key, by default {certificates.public_key_path(certificates.default_key_path())})",
              file=sys.stderr)
        return 2
    try:
        print(certificates.verify(args.certificate, public, status_list_file=args.status_list).summary())
    except certificates.Revoked as e:
        print(f"REVOKED: {e}", file=sys.stderr)
        return 3
    except certificates.CertificateError as e:
        print(f"INVALID: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # a key or status list file that is not one
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from multigpu.credential import certificates

    try:
        path = certificates.revoke(args.certificates, args.id, args.reason, certificates.load_private_key(args.key))
    except (certificates.CertificateError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"revoked {args.id}: {args.reason}\nstatus list signed again: {path}")
    if args.publish:
        return cmd_publish_issuer(argparse.Namespace(outdir=args.publish, certificates=args.certificates, key=args.key))
    print("publish it where the course hosts its issuer files: multigpu publish-issuer DIR")
    return 0


def cmd_publish_issuer(args: argparse.Namespace) -> int:
    from multigpu.credential import certificates

    try:
        files = certificates.publish_issuer(args.outdir, args.certificates, certificates.load_private_key(args.key))
    except (certificates.CertificateError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("host these files at the issuer address the credentials name "
          f"({certificates.resolve_issuer_url(args.certificates)}):")
    for f in files:
        print(f"  {f}")
    return 0


def cmd_certify(args: argparse.Namespace) -> int:
    from multigpu.credential import certificates

    if not args.gradebook.exists():
        print(f"error: no gradebook at {args.gradebook}: run 'make autograde' first", file=sys.stderr)
        return 1
    key = certificates.load_private_key(args.key)
    try:
        url = certificates.resolve_issuer_url(args.out, args.issuer_url)
    except certificates.CertificateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if url == certificates.LOCAL_ISSUER_URL:
        print(f"note: the credentials name the issuer address {url} (for trying the course out); pass "
              "--issuer-url with the address where the course will host its issuer files", file=sys.stderr)
    decisions = certificates.certify(f"sqlite:///{args.gradebook.resolve()}", args.gradebook.parent, args.out, key=key,
                                     issuer_url=url)
    for d in decisions:
        print(f"{d.student:20s} {'CERTIFIED' if d.certified else 'no':10s} {d.reason}"
              + (f" -> {', '.join(map(str, d.files))}" if d.files else ""))
    print(f"{sum(d.certified for d in decisions)} of {len(decisions)} student(s) certified; files in {args.out}/")
    return 0


def _register_certificates(sub: argparse._SubParsersAction) -> None:
    from multigpu.credential.certificates import default_key_path

    p = sub.add_parser("keygen", help="create the course's certificate signing key (outside the repository)")
    p.add_argument("--key", type=Path, default=None, help=f"private key path (default {default_key_path()})")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("verify", help="check a certificate's signature, PDF and revocation status")
    p.add_argument("certificate", type=Path, help="the certificate's .json (or its .pdf)")
    p.add_argument("--public-key", default=None, help="the course's public key file (default: next to the key)")
    p.add_argument("--status-list", type=Path, default=None,
                   help="the course's published status-list.jwt (default: the one next to the certificate)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("revoke", help="revoke a certificate (its bit in the course's status list, with the reason)")
    p.add_argument("id", help="the certificate's id (its file name without .json)")
    p.add_argument("--reason", required=True, help="why, in words anyone may read: verifiers show it")
    p.add_argument("--certificates", type=Path, default=Path("certificates"), help="the folder it was issued to")
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.add_argument("--publish", type=Path, default=None, help="also write the hostable issuer files here")
    p.set_defaults(func=cmd_revoke)

    p = sub.add_parser("publish-issuer", help="write the files the course hosts: issuer profile, key, status list, page")
    p.add_argument("outdir", type=Path, help="folder to write them to (served at the issuer address)")
    p.add_argument("--certificates", type=Path, default=Path("certificates"), help="the folder certificates were issued to")
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.set_defaults(func=cmd_publish_issuer)

    p = sub.add_parser("certify", help="issue certificates to students who passed (after make autograde)")
    p.add_argument("--gradebook", type=Path, default=Path("grading/gradebook.db"),
                   help="the gradebook; the official results are read from results/ next to it")
    p.add_argument("--out", type=Path, default=Path("certificates"))
    p.add_argument("--key", type=Path, default=None, help="private key (default: multigpu keygen's)")
    p.add_argument("--issuer-url", default=None,
                   help="where the course hosts its issuer files (default: the folder's, $MULTIGPU_ISSUER_URL, "
                        "else a local address for trying it out)")
    p.set_defaults(func=cmd_certify)


def register(sub: argparse._SubParsersAction) -> None:
    """The certificate verbs."""
    _register_certificates(sub)
