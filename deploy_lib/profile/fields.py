"""The constrained field types every profile section uses: text without control characters, absolute paths,
environment names, secrets given by reference."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

MAX_STRING = 4096  # longer than any real path or flag value; stops 1 MB strings at the door


def no_control_chars(value: str) -> str:
    bad = next((c for c in value if c in "\x00\n\r" or (ord(c) < 32 and c != "\t")), None)
    if bad is not None:
        raise ValueError(f"contains the control character {bad!r}; newlines and NUL cannot be passed safely")
    return value


Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STRING), AfterValidator(no_control_chars)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/", max_length=MAX_STRING), AfterValidator(no_control_chars)]


# Names that carry credentials; they must come through `secrets:` by reference, never inline.
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIALS?)$", re.IGNORECASE)


class Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, use_enum_values=False)


class SecretRef(Strict):
    """A secret given by reference: the name of a local environment variable, a local file holding it, or a local
    command that prints it (a password manager's CLI: `op read ...`, `pass show ...`, `sops -d ...`)."""

    env: EnvName | None = None
    file: Text | None = None
    command: Annotated[tuple[Text, ...], Field(min_length=1, max_length=64)] | None = Field(
        None, description="argv run on this machine without a shell; its stdout is the value")

    @field_validator("command", mode="before")
    @classmethod
    def _command_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"write the command as a list of words, run without a shell: e.g. "
                             f"`command: {json.dumps(value.split())}`")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if sum(source is not None for source in (self.env, self.file, self.command)) != 1:
            raise ValueError("give exactly one of `env: VAR_NAME`, `file: /path/to/secret` or "
                             "`command: [op, read, op://vault/item/field]`")
        return self


def _secret_ref(value: Any) -> Any:
    if isinstance(value, str | int | float):
        raise ValueError(
            "secrets are never written inline; give `{env: VAR_NAME}` (a local environment variable), "
            "`{file: /path}` (a local file) or `{command: [pass, show, NAME]}` (a local command that prints it)"
        )
    return value


SecretField = Annotated[SecretRef, BeforeValidator(_secret_ref), Field(
    description="{env: NAME}, {file: PATH} or {command: [ARGV...]}")]
