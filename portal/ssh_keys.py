"""SSH public keys as a customer pastes them (one OpenSSH `.pub` line each).

Each line is read the way `ssh-keygen -l` would: the declared type, then the
base64 key blob, whose first field must name the same type and whose other
fields must have the sizes that type gives them. A line that fails says why in
words a customer can act on; nothing here trusts the text around the blob.
Plain Python (base64, struct): the web process installs nothing for it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import unicodedata
from dataclasses import dataclass

# What the portal accepts: the types current OpenSSH servers take by default.
# DSA is off in OpenSSH since 7.0 and gone in 9.8; certificates need a CA the
# machines would have to trust.
ED25519 = "ssh-ed25519"
RSA = "ssh-rsa"
ECDSA_CURVES = {
    "ecdsa-sha2-nistp256": "nistp256",
    "ecdsa-sha2-nistp384": "nistp384",
    "ecdsa-sha2-nistp521": "nistp521",
}
# An uncompressed point: 0x04, then x and y of the curve's size.
ECDSA_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com"
KEY_TYPES = (ED25519, *ECDSA_CURVES, SK_ED25519, SK_ECDSA, RSA)

RSA_MIN_BITS = 2048
# ssh-keygen makes at most 16384 bits; anything longer is not a key someone made.
RSA_MAX_BITS = 16384
# A FIDO application string ("ssh:" by default) is short; OpenSSH caps nothing
# here, the portal caps it so a blob cannot carry a payload.
SK_APPLICATION_MAX = 256

# A form takes this many keys, each line at most this long (a 16384-bit RSA
# key with a comment fits).
MAX_KEYS = 10
MAX_LINE = 4096


PRIVATE_KEY = (
    "is a private key. Never share it: paste the public key instead (the file ending in .pub)."
)
SSH2_FORMAT = (
    "is in the SSH2 (PuTTY) format. Convert it to one OpenSSH line with "
    "`ssh-keygen -i -f key.pub`, or copy it from PuTTYgen's "
    '"Public key for pasting into OpenSSH authorized_keys file" box.'
)


def looks_private(text: str) -> bool:
    """A private key pasted by mistake: never stored, never shown back."""
    return "PRIVATE KEY" in text


class KeyRefused(ValueError):
    """One line that is no SSH public key the portal accepts; the message says why."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: bytes
    comment: str
    bits: int  # RSA modulus bits; the curve's size for the others

    @property
    def line(self) -> str:
        """The line as it goes into ~/.ssh/authorized_keys."""
        text = f"{self.key_type} {base64.b64encode(self.blob).decode('ascii')}"
        return f"{text} {self.comment}" if self.comment else text

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -l` prints it: SHA256, base64 without padding."""
        digest = base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii")
        return "SHA256:" + digest.rstrip("=")


def parse_key(line: str) -> PublicKey:
    """The key of one `.pub` line, or KeyRefused with the reason."""
    text = line.strip()
    if len(text) > MAX_LINE:
        raise KeyRefused(
            f"is {len(text)} characters long; a public key line has at most {MAX_LINE}."
        )
    if "PRIVATE KEY" in text:
        raise KeyRefused(PRIVATE_KEY)
    if "BEGIN SSH2 PUBLIC KEY" in text:
        raise KeyRefused(SSH2_FORMAT)
    if any(unicodedata.category(ch)[0] == "C" for ch in text):
        raise KeyRefused("contains control characters; paste the single line of the .pub file.")
    parts = text.split(None, 2)
    if not parts:
        raise KeyRefused("is empty.")
    key_type = parts[0]
    if key_type not in KEY_TYPES:
        raise KeyRefused(_unknown_type(key_type))
    if len(parts) < 2:
        raise KeyRefused(f"has the type {key_type} but no key after it.")
    comment = parts[2].strip() if len(parts) > 2 else ""
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise KeyRefused(
            "is not a valid key: the part after the type is not base64 (was it cut or wrapped?)."
        ) from None
    fields = _Fields(blob)
    inner = fields.text("the key type")
    if inner != key_type:
        raise KeyRefused(
            f"says {key_type} but the key inside is {inner or 'of no known type'}: "
            "paste the line unchanged."
        )
    bits = _check_body(key_type, fields)
    if fields.left():
        raise KeyRefused("is not a valid key: its data goes on after the key ends.")
    return PublicKey(key_type=key_type, blob=blob, comment=comment, bits=bits)


def parse_keys(text: str) -> tuple[list[PublicKey], list[str]]:
    """The keys of a pasted list (one per line; blank lines and # comments
    skipped, the same key twice kept once) and the reasons lines were refused,
    each naming its line."""
    # A whole block (a private key, an SSH2 file) is one mistake, not a
    # refusal for each of its lines.
    if looks_private(text):
        return [], [f"This {PRIVATE_KEY}"]
    if "BEGIN SSH2 PUBLIC KEY" in text:
        return [], [f"This key {SSH2_FORMAT}"]
    keys: list[PublicKey] = []
    errors: list[str] = []
    seen: set[bytes] = set()
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) > MAX_KEYS:
        return [], [f"{len(lines)} keys given; an order takes at most {MAX_KEYS}."]
    for n, line in lines:
        try:
            key = parse_key(line)
        except KeyRefused as exc:
            errors.append(f"Line {n} {exc}")
            continue
        if key.blob not in seen:
            seen.add(key.blob)
            keys.append(key)
    return keys, errors


def _unknown_type(key_type: str) -> str:
    shown = key_type if len(key_type) <= 40 else key_type[:40] + "…"
    if key_type == "ssh-dss":
        return (
            "is a DSA key, which current SSH servers refuse. Make an Ed25519 key: "
            "`ssh-keygen -t ed25519`."
        )
    if key_type.endswith("-cert-v01@openssh.com"):
        return "is a certificate; paste the plain public key instead."
    return (
        f'does not start with a key type the machines accept ("{shown}"). '
        "Expected ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256/384/521 or a security-key "
        "(sk-) type; make one with `ssh-keygen -t ed25519`."
    )


def _check_body(key_type: str, fields: _Fields) -> int:
    """The key's size in bits, once every field after the type has the size its type gives it."""
    if key_type in (ED25519, SK_ED25519):
        if len(fields.string("the Ed25519 key")) != 32:
            raise KeyRefused("is not a valid key: an Ed25519 key is 32 bytes.")
        bits = 256
    elif key_type == RSA:
        exponent = fields.mpint("the RSA exponent")
        modulus = fields.mpint("the RSA modulus")
        bits = modulus.bit_length()
        if exponent < 3 or exponent % 2 == 0:
            raise KeyRefused("is not a valid key: its RSA exponent is not an odd number above 2.")
        if bits < RSA_MIN_BITS:
            raise KeyRefused(
                f"is an RSA key of {bits} bits; at least {RSA_MIN_BITS} are needed. "
                "Make an Ed25519 key (`ssh-keygen -t ed25519`) or a longer RSA key."
            )
        if bits > RSA_MAX_BITS:
            raise KeyRefused(f"is an RSA key of {bits} bits; at most {RSA_MAX_BITS} are taken.")
    else:
        curve = ECDSA_CURVES.get(key_type, "nistp256")
        if fields.text("the curve name") != curve:
            raise KeyRefused(f"is not a valid key: a {key_type} key is on the curve {curve}.")
        point = fields.string("the curve point")
        if len(point) != ECDSA_POINT_BYTES[curve] or point[:1] != b"\x04":
            raise KeyRefused(f"is not a valid key: its point is not one of the curve {curve}.")
        bits = int(curve.removeprefix("nistp"))
    if key_type in (SK_ED25519, SK_ECDSA):
        application = fields.text("the security key's application")
        if not application or len(application) > SK_APPLICATION_MAX:
            raise KeyRefused(
                "is not a valid key: its security-key application is missing or too long."
            )
    return bits


class _Fields:
    """The SSH wire format's fields (RFC 4251: uint32 length, then the bytes), read in turn."""

    def __init__(self, blob: bytes):
        self.blob, self.at = blob, 0

    def string(self, what: str) -> bytes:
        if self.at + 4 > len(self.blob):
            raise KeyRefused(f"is not a valid key: it ends before {what}.")
        (length,) = struct.unpack_from(">I", self.blob, self.at)
        start = self.at + 4
        if length > len(self.blob) - start:
            raise KeyRefused(f"is not a valid key: {what} is cut short.")
        self.at = start + length
        return self.blob[start : self.at]

    def text(self, what: str) -> str:
        try:
            return self.string(what).decode("ascii")
        except UnicodeDecodeError:
            raise KeyRefused(f"is not a valid key: {what} is not text.") from None

    def mpint(self, what: str) -> int:
        data = self.string(what)
        if data[:1] and data[0] & 0x80:
            raise KeyRefused(f"is not a valid key: {what} is negative.")
        return int.from_bytes(data, "big")

    def left(self) -> int:
        return len(self.blob) - self.at
