"""`GET /` of `nmtkit serve`: the page to try a model in a browser (docs/serve.md, "The page").

One static file, nmtkit/serving/static/index.html, with its style and script inline and nothing
fetched from elsewhere, so it works offline. It talks to the server's own JSON API (/info,
/translate, /attention) and puts every text it receives into the page as text (`textContent`,
canvas `fillText`), never as HTML.

Why a Content-Security-Policy with hashes: should a text ever reach the page as markup all the
same, the browser runs no script and loads nothing that is not the page's own inline script and
style (allowed by their SHA-256, computed here from the file), and talks to no other origin.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


@dataclass(frozen=True)
class Page:
    body: bytes
    headers: dict


@lru_cache(maxsize=1)
def page() -> Page:
    """The page and the headers it is served with."""
    html = resources.files("nmtkit.serving").joinpath("static/index.html").read_text(encoding="utf-8")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, content in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(content.encode("utf-8")).digest()).decode()
        hashes[kind].append(f"'sha256-{digest}'")
    csp = ("default-src 'none'; connect-src 'self'; img-src 'self' data:; "
           f"script-src {' '.join(hashes['script'])}; style-src {' '.join(hashes['style'])}; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    headers = {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
    return Page(html.encode("utf-8"), headers)
