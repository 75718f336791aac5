"""Terminal tables and plots of profiles and plans."""
