"""Hardware simulator: fake pynvml, fake sysfs trees in the kernel's formats, board profiles, faults."""
