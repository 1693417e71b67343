"""rubberband.cloud"""
