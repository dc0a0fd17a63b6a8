"""Low-level image data: reading and writing files (``io``), expanding inputs (``sources``) and the official resize
and normalise rules (``transforms``). It imports nothing else from sapiens2; training datasets live in ``train``."""
