"""Drop-in compatibility layers for other serving stacks (SGLang's EAGLE Python helpers: :mod:`.sglang`)."""
