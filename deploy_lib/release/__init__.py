"""A release: what one host's server runs, as data, and everything rendered from it (planning: pure).

    model        Release: the profile resolved for one host and SGLang version, its content id, its semantic diff
    server_args  the SGLang launch command and environment for one SGLang version
    argv_check   an argv checked against the options SGLang reported (host_scripts/sglang_options.py)
    render       the systemd unit, launcher and environment file, quoted by systemd's own rules
"""
