"""The Textual apps (live and replay) and their screens; widgets/ draw what these give them."""
