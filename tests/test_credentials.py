"""Credentials recognised by value (issue 40: `env: {AWS_SECRET_ACCESS_KEY: wJalr...}` and `HF_AUTH: hf_...` were
rendered in clear under "environment file (secrets redacted)", since only names were looked at). The values here are
fakes of each credential's real shape; none is live."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deploy_lib.errors import ConfigError
from deploy_lib.facts.hand_process import split_environment
from deploy_lib.profile import Profile, read_stored_profile
from deploy_lib.profile.credentials import looks_like_credential
from deploy_lib.profile.loading import format_validation_error
from deploy_lib.profile.overrides import parse_assignments

# (value, the kind it is named as)
CREDENTIALS = [
    ("AKIAIOSFODNN7EXAMPLE", "an AWS access key id"),
    ("ASIAY34FZKBOKMUTVV7A", "an AWS access key id"),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "an AWS secret access key"),
    ("hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "a Hugging Face token"),
    ("Bearer hf_QwErTyUiOpAsDfGhJkLzXcVbNm12345678", "a Hugging Face token"),
    ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "a GitHub token"),
    ("github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW", "a GitHub token"),
    ("sk-proj-Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kA", "an OpenAI-style API key"),
    ("sk-ant-api03-Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kAabc", "an OpenAI-style API key"),
    ("sk-3Xk3vN9qL2mP8rT5wY7zB1cD4fG6hJ0kAab", "an OpenAI-style API key"),
    ("xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "a Slack token"),
    ("https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX", "a Slack webhook URL"),
    ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "a JSON Web Token"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "a PEM private key"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "a PEM private key"),
    ("https://deploy:s3cr3tpass@git.example.com/models.git", "a URL with a password"),
    ("Zx8Qp2Lm7Vn4Rt6Yw1Ks9Bd3Hf5Jg0Ca8Ue2Io4Pa6", "a long random string (42 characters)"),
    ("4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d", "a long random hex string (40 characters)"),
]
# What an `env:` holds every day: paths, model ids, numbers, URLs without a password, lists, words joined.
ORDINARY = [
    "lukealonso/GLM-5-NVFP4", "/usr/local/cuda-12.8", "0,1,2,3,4,5,6,7", "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-ai/DeepSeek-V3-0324-FP4-Quantized-Model", "Qwen2.5-72B-Instruct-GPTQ-Int4-AWQ-Marlin-v2",
    "http://10.0.0.5:8000/v1/chat/completions?model=x", "https://huggingface.co/lukealonso/GLM-5-NVFP4",
    "expandable_segments:True,max_split_size_mb:512", "1800", "0.92", "en_US.UTF-8", "1", "true",
    "TORCH_CUDA_ARCH_LIST_value_ABCDEFG12345_long_name", "NCCL_IB_HCA_mlx5_0_mlx5_1_mlx5_2_mlx5_3_mlx5_4",
    "0000000000000000000000000000000000000000", "sglang-deploy-release-20260101-abcdef-deadbeef",
    "my-service-name-production-us-east-1-cluster-a", "ens1f0np0", "-----BEGIN CERTIFICATE-----",
    "/root/.cache/huggingface/hub/models--lukealonso--GLM-5-NVFP4/snapshots/4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d",
    "~/models/Zx8Qp2Lm7Vn4Rt6Yw1Ks9Bd3Hf5Jg0Ca8Ue2Io4Pa6", "8.0;8.6;9.0;10.0;12.0+PTX", "desk-top-sk-not-a-key",
    "hf_transfer", "skip", "------", "",
]


@pytest.mark.parametrize(("value", "kind"), CREDENTIALS)
def test_a_credential_is_recognised_by_its_value(value: str, kind: str) -> None:
    found = looks_like_credential(value)
    assert found is not None and found.kind == kind


@pytest.mark.parametrize("value", ORDINARY)
def test_an_ordinary_value_is_not_taken_for_a_credential(value: str) -> None:
    assert looks_like_credential(value) is None


def profile(env: dict[str, str], **more: object) -> Profile:
    return Profile.model_validate({"model": {"path": "m"}, "env": env, **more})


@pytest.mark.parametrize(("value", "kind"), CREDENTIALS)
def test_a_profile_refuses_an_env_value_that_looks_like_a_credential_without_repeating_it(value: str,
                                                                                           kind: str) -> None:
    with pytest.raises(ValidationError) as refusal:
        profile({"AUTH_HEADER": value})
    message = format_validation_error("p.yaml", refusal.value, Profile)  # as the tool shows it
    assert f"AUTH_HEADER: its value looks like {kind}" in message
    assert "secrets: {AUTH_HEADER: {env: AUTH_HEADER}}" in message
    assert value not in message and value.split("\n")[0] not in message


def test_a_flagged_value_said_not_to_be_a_secret_is_kept() -> None:
    digest = "4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d"
    assert profile({"BUILD_COMMIT": digest}, not_secret=["BUILD_COMMIT"]).environment()["BUILD_COMMIT"] == digest


@pytest.mark.parametrize(("env", "not_secret", "refusal"), [
    ({"A": "x"}, ["B"], "not_secret: B is not in env"),
    ({"A": "plain"}, ["A"], "not_secret: env.A does not look like a credential"),
    ({"HF_TOKEN": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"}, ["HF_TOKEN"], "env.HF_TOKEN looks like a secret"),
    ({"A": "4f9d2c7e1a8b3f6d0c5e9a2b7f4d1c8e3a6b9f0d"}, ["A", "A"], "not_secret: a name is given twice"),
])
def test_not_secret_waives_only_a_value_check_that_would_refuse(env: dict[str, str], not_secret: list[str],
                                                                  refusal: str) -> None:
    with pytest.raises(ValidationError, match=refusal.replace(".", r"\.").replace("{", r"\{")):
        profile(env, not_secret=not_secret)


def test_a_set_option_with_a_credential_is_refused_without_repeating_it() -> None:
    with pytest.raises(ConfigError) as refusal:
        parse_assignments(["hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"])
    assert "hf_aBcDe" not in str(refusal.value) and "<not shown: it looks like a credential>" in str(refusal.value)


def test_adopt_takes_a_credential_by_value_as_a_secret() -> None:
    """A hand-run server's `HF_AUTH=hf_...` goes to the release's env file as a secret, not to the profile's env."""
    split = split_environment({"HF_AUTH": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "OMP_NUM_THREADS": "8"}, False)
    assert (split.secrets, split.env) == ({"HF_AUTH": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"},
                                          {"OMP_NUM_THREADS": "8"})


def test_a_release_recorded_before_with_such_a_value_is_still_read_for_its_stop() -> None:
    """A release 0 adopted by an earlier version kept `HF_AUTH: hf_...` in its recorded profile's env; stopping its
    hand-run server reads the stop timeout from that record (commands/deploy.py stop), which a strict read now
    refuses."""
    recorded = {"model": {"path": "m"}, "env": {"HF_AUTH": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"},
                "service": {"stop_timeout_s": 77}}
    with pytest.raises(ValidationError):
        Profile.model_validate(recorded)
    assert read_stored_profile(recorded).service.stop_timeout_s == 77
