"""The run timeline: place 0's recorder and its HTML view."""
