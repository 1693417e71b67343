"""rubberband.executor"""
