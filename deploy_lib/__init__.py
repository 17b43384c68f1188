"""sglang-deploy: typed SGLang deployment profiles to healthy, verified servers."""
