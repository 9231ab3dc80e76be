"""CTranslate2: `convert` writes an export directory's model, `engine` translates with it.

An export directory (`nmtkit export --format ctranslate2`) holds CTranslate2's model.bin and
vocabularies beside nmtkit's dictionaries, subword models and `nmtkit.json`
(`nmtkit.backends.directory`). Needs the `ctranslate2` extra: pip install -e '.[ctranslate2]' in the nmtkit checkout.
"""
