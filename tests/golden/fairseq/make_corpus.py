"""A synthetic word-for-word translation task for the fairseq fixtures (deterministic, seed 1).

Source words are invented; each maps to one target word, with punctuation and casing kept, so a
tiny model learns it in a few hundred updates and its search has clear winners. Writes
OUT/{train,valid,test}.{src,tgt} (raw text, untokenized).
"""

import random
import sys
from pathlib import Path

rng = random.Random(1)
SYL_S = ["ka", "lo", "mi", "ne", "ru", "ta", "zo", "bi", "fe", "gu"]
SYL_T = ["an", "el", "or", "us", "ip", "et", "om", "ar", "in", "ux"]
src_words = sorted({"".join(rng.choice(SYL_S) for _ in range(rng.randint(1, 3))) for _ in range(60)})
tgt_of = {w: "".join(SYL_T[SYL_S.index(w[i:i + 2])] for i in range(0, len(w), 2))[::-1] for w in src_words}


def pair() -> tuple[str, str]:
    words = [rng.choice(src_words) for _ in range(rng.randint(2, 8))]
    src, tgt = list(words), [tgt_of[w] for w in words]
    if rng.random() < 0.3:  # a comma after some word
        i = rng.randrange(len(words) - 1)
        src[i] += ","
        tgt[i] += ","
    if rng.random() < 0.5:  # a capital first letter
        src[0], tgt[0] = src[0].capitalize(), tgt[0].capitalize()
    end = rng.choice([".", ".", "?", ""])
    return " ".join(src) + end, " ".join(tgt) + end


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for split, n in (("train", 4000), ("valid", 100), ("test", 40)):
    pairs = [pair() for _ in range(n)]
    (out / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
    (out / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))
