"""One module per decoder family, each registering a `models.family.Family`; a family is
imported when its name (or, for a checkpoint, any architecture) is first looked up."""
