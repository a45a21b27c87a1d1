"""Files in and out: walking folders (``.gitignore``), loaders, adding and syncing folders,
export, import and copy."""
