"""Index mode: the host downloads the pinned uv wheel from the index itself (argv: index URL, file name, sha256,
wheels/<sha256>), keeping it only when its sha256 is the pinned one.

Standard library only, no deploy_lib imports; run by the host's python (`python3 -I -c`). The index is a PEP 503
simple page; a failure exits non-zero with its reason on stderr.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import sys
import urllib.parse
import urllib.request


def wheel_url(index: str, filename: str) -> str:
    page_url = index.rstrip("/") + "/uv/"
    with urllib.request.urlopen(page_url, timeout=60) as response:
        page = response.read().decode("utf-8", "replace")
    links = [urllib.parse.urljoin(page_url, html.unescape(href)) for href in re.findall(r'href="([^"]+)"', page)]
    found = [url for url in links if urllib.parse.unquote(urllib.parse.urlsplit(url).path).endswith("/" + filename)]
    if not found:
        sys.exit(f"{page_url} does not list {filename}")
    return found[0]


def fetch(index: str, filename: str, expected: str, directory: str) -> None:
    url = wheel_url(index, filename)
    os.makedirs(directory, exist_ok=True)
    dest = os.path.join(directory, filename)
    digest = hashlib.sha256()
    with urllib.request.urlopen(url.split("#")[0], timeout=600) as response, open(dest + ".part", "wb") as out:
        for chunk in iter(lambda: response.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected:
        os.unlink(dest + ".part")
        sys.exit(f"{url}: sha256 {digest.hexdigest()}, expected {expected} (the pinned uv wheel); not kept")
    os.chmod(dest + ".part", 0o644)
    os.replace(dest + ".part", dest)


if __name__ == "__main__":
    fetch(*sys.argv[1:5])
