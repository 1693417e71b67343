"""rubberband.profiler"""
