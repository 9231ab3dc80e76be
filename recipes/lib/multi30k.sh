# Sourced by the recipes that train on Multi30k (quickstart.sh, multilingual.sh): the one place
# that knows where its files come from. NMTKIT_DATA: a folder that already holds them (checked;
# nothing is downloaded). Otherwise each missing file is downloaded once into NMTKIT_CACHE
# (default ${XDG_CACHE_HOME:-~/.cache}/nmtkit/multi30k), under a temporary name, and checked as
# gzip before it takes its own: a cut or HTML download never counts as a file.
#   NMTKIT_MULTI30K_URL  download location (default: the GitHub multi30k/dataset task1/raw folder)
MULTI30K_URL=${NMTKIT_MULTI30K_URL:-https://github.com/multi30k/dataset/raw/master/data/task1/raw}

multi30k_files() {  # multi30k_files LANG...: train, val and test_2016_flickr of each, one a line
    local split l
    for split in train val test_2016_flickr; do for l in "$@"; do echo "$split.$l.gz"; done; done
}

multi30k_raw() {  # multi30k_raw LANG...: RAW set to a folder that holds the files of these languages
    local files f n
    files=$(multi30k_files "$@")
    if [ -n "${NMTKIT_DATA:-}" ]; then
        RAW=$NMTKIT_DATA
        for f in $files; do
            [ -f "$RAW/$f" ] || die "NMTKIT_DATA=$RAW has no $f"
        done
        say "data: using $RAW"
        return
    fi
    RAW=${NMTKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nmtkit/multi30k}
    mkdir -p "$RAW"
    n=$(echo "$files" | wc -l)
    for f in $files; do
        [ -s "$RAW/$f" ] && continue
        say "data: downloading $MULTI30K_URL/$f"
        python - "$MULTI30K_URL/$f" "$RAW/$f" "${RECIPE_NAME:-recipe}" "$n" <<'EOF'
import gzip, os, sys, urllib.request
url, dest, recipe, n = sys.argv[1:5]
tmp = dest + ".part"
try:
    with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as fh:
        fh.write(r.read())
    with gzip.open(tmp) as g:  # a truncated or HTML download fails here, not later
        while g.read(1 << 20):
            pass
except Exception as e:
    if os.path.exists(tmp):
        os.unlink(tmp)
    sys.exit(f"[{recipe}] cannot download {url}: {e}\n"
             f"  (offline?) Put the {n} Multi30k files in a folder and set NMTKIT_DATA to it.")
os.replace(tmp, dest)
EOF
    done
    say "data: $RAW"
}
