"""verify: the database against the disk, one verdict per unit."""
