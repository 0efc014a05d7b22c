"""What portal, campaigns and gpuworker all use, and that depends on none of them."""
