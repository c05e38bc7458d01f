"""What the agent reads from the host outside the vendor libraries: the kernel log, PCI, hwmon, the BMC, the
supply rails, /proc and cgroups. Parsers and readers only: nothing here schedules or stores."""
