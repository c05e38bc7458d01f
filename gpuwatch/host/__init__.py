"""Host power delivery and sensors: hwmon (PMBus supplies, mapped Super-I/O rails, temperatures, fans) and the BMC."""
