"""Hardware topology: hosts, devices per host, memory per device, chip prices."""
