"""The node agent: `nvmon daemon` (sampling loop, store writer, publisher) and its config."""
