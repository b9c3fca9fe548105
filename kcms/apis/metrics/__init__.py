"""apis/metrics"""
