"""Import: folders, manifests and uploads become units; reading an input and
classifying what is wrong with it (shared by the worker and the setup page's preview)."""
