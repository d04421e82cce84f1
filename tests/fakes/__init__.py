"""Local fakes of cloud APIs that have no emulator, speaking their real wire formats."""
