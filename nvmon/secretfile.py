"""Secret files (the MQTT password, a TLS client key, a hook's token) are refused when others may
read them, as ssh refuses a loose private key: a password anyone on the host can read is no
password. The check is of the mode bits (and the owner, below), never a read test: root reads
everything, so "can someone else read it" is answered by the mode alone.

The rule, as OpenSSH's: a file the reader owns must be private to it (no group or other bits:
`mode & 0o077`, fix `chmod 600`); a file someone else owns (the shipped layout, `root:nvmon 0640`,
shares it with the service's group on purpose) must give others nothing and its group no more than
read (`mode & 0o037`, fix `chmod 640`).
"""

from __future__ import annotations

import errno
import os
import stat


class LooseSecretFile(PermissionError):
    """A secret file others may read; `strerror` (and str()) is the one-line reason with its fix."""

    def __str__(self) -> str:
        return str(self.strerror)


def check_private(path: object) -> None:
    """Raise LooseSecretFile if `path` (through symlinks) is open to others; OSError if it
    cannot be looked at (missing, permission denied on a directory above)."""
    st = os.stat(path)  # type: ignore[arg-type]
    mode = stat.S_IMODE(st.st_mode)
    own = st.st_uid == os.geteuid()
    loose = mode & (0o077 if own else 0o037)
    if loose:
        who = "group or others" if loose & 0o070 else "others"
        fix = "600" if own else "640"
        raise LooseSecretFile(errno.EACCES, f"open to {who} (mode {mode:04o}); run chmod {fix} {path}", str(path))
