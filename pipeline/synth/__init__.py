"""The synthetic face set: a face renderer and the competition file layout."""
