"""SSH public keys as a customer pastes them: read as ssh-keygen reads them,
or refused with a reason (portal/ssh_keys.py)."""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from portal.ssh_keys import KEY_TYPES, KeyRefused, parse_key, parse_keys

# Real keys, made with ssh-keygen (OpenSSH 9); fingerprints as `ssh-keygen -l` prints them.
ED25519 = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIh+nxitNU7kERRlaGoH5vq6fcDua12EgrPILaB6+y81 ada@laptop"
)
ED25519_FINGERPRINT = "SHA256:sq99A81qifPwOlPQgoIvNbgaCC93yU/qN/JDVIur+E8"
RSA_2048 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCY5prdMugopa0LJzEiEa1hCarD488w1G/1QOR+x3S5RPGPyAd7bY8U"
    "PkGpBZylclTWVJLN2XOeHko0tGO1vJktsL0lsbePWETR/3E6SpWCeUPRzbyLFV8PoMs0ra/V/gIfWMZj+A1h4rqVw0XB"
    "LU/ic+p4XKDfKWRk5grIdTmrOZ4JWFd/Z8hPd+57f+q6JtYsxqYbsSN1sxci3lXCIOBobSaFBCjSVrP10ErC/XT9yS0Q"
    "oeQqO7kEH1AkGU5WepYDFE6NyCmaOVrtgde7TYUsbnlZAOplvCACjyOZvAoyqEeWH9WMpEf1uiiSjtkRi4or9qpKJmxz"
    "tKnj/njrZFGH ada@laptop"
)
RSA_2048_FINGERPRINT = "SHA256:G4zh0/JR33kXcfbPun8ZeThHMc3sQLkRpFqOcwXsjdM"
RSA_1024 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCcEL3f0a5Hh0jlmKdEqM4XGgk4FtyOMlQAPl2v1U9A/rk3bMmZ8a4Is1"
    "SxdbKhxKFhsSzpkfE1BMlunMNshTuaTgjMsOqBEPXe8BSKVCmCmjqg78zrGN0UxBcwUdr34AZ0I82hz4Do+fDhLpbaTtl"
    "ZSnhgdz4ODGIHTkPgCrsg2Q== ada@laptop"
)
ECDSA = {
    256: "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBF6Hb5OPJ0XUWp4v"
    "x1Kgy259CDgeeVcMglDHQoeNgyR41L5tbp1sADm1g8gk5fbGF1qVsVYj4vwmMpg7W1p/XlE=",
    384: "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBC3rR+sf6nS2kMoI"
    "6SESQDSawjhlKhCfKaXG7cXFmiWYsIE5CbK+FXMozIE/uDKqWSXIwY46+4Y0NhEvdBr6hNIJdykV6nefVr76ypj5dxtUdSp5"
    "iyJfPbLup70s/Pub1Q==",
    521: "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBAApdyQYEpRhAqHE"
    "KFnSQkQBc5wh7XrIeCH33FZ61DLA/LylaoX8wKFvf92mN90QXhFnKNtAJip/93WGukvQFwkU7AFgvnYOZfi2LwFzVFojELEP"
    "WQWMixa8PcGLmi9YfAaz8Vylntt1L61xQe7uksQ0SV8R5/OR9w1HlTG4iSj9/ugeRA==",
}
ECDSA_FINGERPRINTS = {
    256: "SHA256:J972uJHK3UQynCD3qDjKKhexLmKUiymxguNhs9MGWV0",
    384: "SHA256:Euqu45VVF39vGjjs66qw6pGZvL6lLGsRCKzz4CFh5fQ",
    521: "SHA256:M3ssGWuq9Qur4ARXFfaSLpweJFc46Nqy/tZUDbbuoP0",
}


def _wire(*fields: bytes) -> str:
    """An SSH wire-format blob (RFC 4251 strings), base64: keys no ssh-keygen here can make."""
    return base64.b64encode(b"".join(struct.pack(">I", len(f)) + f for f in fields)).decode()


def _blob(line: str) -> bytes:
    return base64.b64decode(line.split()[1])


# --- the keys ------------------------------------------------------------------------


def test_every_key_type_the_machines_take_is_read_with_its_ssh_keygen_fingerprint():
    assert parse_key(ED25519).fingerprint == ED25519_FINGERPRINT
    rsa = parse_key(RSA_2048)
    assert (rsa.key_type, rsa.bits, rsa.fingerprint) == ("ssh-rsa", 2048, RSA_2048_FINGERPRINT)
    assert rsa.comment == "ada@laptop" and rsa.line == RSA_2048
    for bits, line in ECDSA.items():
        key = parse_key(line)
        assert (key.bits, key.fingerprint) == (bits, ECDSA_FINGERPRINTS[bits])
    # Security keys (FIDO): no authenticator here, so built field by field.
    sk_ed = f"sk-ssh-ed25519@openssh.com {_wire(b'sk-ssh-ed25519@openssh.com', b'k' * 32, b'ssh:')}"
    point = b"\x04" + b"p" * 64
    sk_ec = "sk-ecdsa-sha2-nistp256@openssh.com " + _wire(
        b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", point, b"ssh:"
    )
    assert parse_key(sk_ed).key_type == "sk-ssh-ed25519@openssh.com"
    assert parse_key(sk_ec).bits == 256


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA!!!notbase64", "not base64"),
        # The declared type is not the one inside the blob.
        (f"ssh-rsa {ED25519.split()[1]}", "says ssh-rsa but the key inside is ssh-ed25519"),
        (RSA_1024, "RSA key of 1024 bits; at least 2048"),
        (f"ssh-ed25519 {_wire(b'ssh-ed25519', b'k' * 31)}", "an Ed25519 key is 32 bytes"),
        # A length that runs past the end of the blob.
        ("ssh-ed25519 " + base64.b64encode(_blob(ED25519)[:-5]).decode(), "cut short"),
        ("ssh-ed25519 " + base64.b64encode(_blob(ED25519) + b"\0").decode(), "goes on after"),
        (f"ecdsa-sha2-nistp384 {ECDSA[256].split()[1]}", "the key inside is ecdsa-sha2-nistp256"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA key"),
        ("ssh-ed25519", "no key after it"),
        ("hello world", "does not start with a key type"),
        (f"{ED25519}\x07", "control characters"),
    ],
)
def test_a_bad_key_is_refused_with_a_reason_a_customer_can_act_on(line, reason):
    with pytest.raises(KeyRefused, match=reason):
        parse_key(line)


def test_a_list_names_the_line_of_each_bad_key_and_keeps_a_key_given_twice_once():
    keys, errors = parse_keys(f"{ED25519}\n\n# my laptop\n{RSA_1024}\n{ED25519}\nnot a key\n")
    assert [key.fingerprint for key in keys] == [ED25519_FINGERPRINT]
    assert [error.split(" is ")[0].split(" does ")[0] for error in errors] == ["Line 4", "Line 6"]


@given(st.text(max_size=600))
def test_any_pasted_text_gives_keys_or_reasons_never_an_exception(text):
    keys, errors = parse_keys(text)
    assert all(isinstance(error, str) and error for error in errors)
    for key in keys:  # a kept key reads back as the same key
        assert parse_key(key.line) == key


@given(st.sampled_from(KEY_TYPES), st.binary(max_size=400))
def test_any_blob_under_any_type_is_a_key_or_a_reason(key_type, blob):
    try:
        key = parse_key(f"{key_type} {base64.b64encode(blob).decode()}")
    except KeyRefused:
        return
    assert (key.key_type, key.blob) == (key_type, blob)


def test_more_keys_than_an_order_takes_are_refused():
    keys, errors = parse_keys("\n".join([ED25519] * 11))
    assert keys == [] and errors == ["11 keys given; an order takes at most 10."]
