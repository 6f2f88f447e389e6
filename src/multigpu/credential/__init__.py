"""The course's credential: what a certificate says and how anyone checks or withdraws it.

It sits above the judging (:mod:`multigpu.grading`): it reads official results and never decides
a verdict. In the order a certificate's life runs:

    course_key    the course's Ed25519 key pair (outside the repository), made once
    certificates  who gets a certificate (an official result that passed, sandboxed, not held)
                  and the names callers use: certify, issue, verify, revoke, publish_issuer
    credentials   a certificate's files: the record, the PDF, the signed credential; verifying,
                  revoking, the hostable issuer files
    openbadges    the Open Badges 3.0 credential (a VC-JWT) and the issuer profile; the page
                  verify.html that checks one in a browser
    status_list   the signed revocation list (a W3C Bitstring Status List)
    cli           ``multigpu keygen | certify | verify | revoke | publish-issuer``
"""
