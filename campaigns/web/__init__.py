"""The campaigns pages: views, forms and URLs. Thin: selectors read, services write."""
