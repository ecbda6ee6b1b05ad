"""Search permission on a directory for one account, through a POSIX ACL
entry: what the embedded PostgreSQL's account needs on the directories
above its data (gateway/process/embedded_pg.py), granted to that account alone
instead of to every user (o+x).

The ACL is read and written as the kernel stores it, in an extended
attribute (linux/posix_acl_xattr.h): no ``setfacl`` needed, which most
servers do not install.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import struct
from pathlib import Path

# A version word, then (tag, perm, id) entries ordered by tag, then id.
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_SEARCH = 0o1
AclEntry = tuple[int, int, int]


def _read_acl(path: Path) -> list[AclEntry] | None:
    try:
        blob = os.getxattr(path, _ACL_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise
    return [struct.unpack_from("<HHI", blob, at) for at in range(4, len(blob), 8)]


def may_search(path: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account``, with its primary group only (the server runs so),
    may search directory ``path``: the kernel's check, ACL entries included."""
    st = path.stat()
    if st.st_uid == account.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    acl = _read_acl(path) or []
    mask = next((perm for tag, perm, _ in acl if tag == _MASK), 0o7)
    for tag, perm, uid in acl:
        if tag == _USER and uid == account.pw_uid:
            return bool(perm & mask & _SEARCH)
    groups = [perm for tag, perm, gid in acl if tag == _GROUP and gid == account.pw_gid]
    if st.st_gid == account.pw_gid:
        own = [perm for tag, perm, _ in acl if tag == _GROUP_OBJ]
        groups.append(own[0] if own else (st.st_mode >> 3) & 0o7)
    if groups:
        return any(perm & mask & _SEARCH for perm in groups)
    return bool(st.st_mode & stat.S_IXOTH)


def grant_search(path: Path, account: pwd.struct_passwd) -> None:
    """Add ``user:<account>:--x`` to ``path``'s ACL; every other entry stays."""
    mode = path.stat().st_mode
    acl = _read_acl(path)
    if acl is None:  # the mode bits as an ACL
        acl = [(_USER_OBJ, (mode >> 6) & 0o7, _NO_ID), (_GROUP_OBJ, (mode >> 3) & 0o7, _NO_ID),
               (_OTHER, mode & 0o7, _NO_ID)]
    mask = next((perm for tag, perm, _ in acl if tag == _MASK),
                next(perm for tag, perm, _ in acl if tag == _GROUP_OBJ))
    mine = next((perm for tag, perm, uid in acl if tag == _USER and uid == account.pw_uid), 0)
    acl = [e for e in acl if e[0] != _MASK and not (e[0] == _USER and e[2] == account.pw_uid)]
    acl += [(_USER, mine | _SEARCH, account.pw_uid), (_MASK, mask | _SEARCH, _NO_ID)]
    acl.sort(key=lambda e: (e[0], e[2]))
    os.setxattr(path, _ACL_XATTR, struct.pack("<I", _ACL_VERSION)
                + b"".join(struct.pack("<HHI", *e) for e in acl))
