"""trackers"""
