# A Scrapy project whose every request goes through a proxy leased from
# egress-proxies: the middleware and the EGRESS_PROXIES_* settings below are
# all it takes. The values come from the environment here so the project's
# test can point it at its own broker.
import os

BOT_NAME = "sitecrawl"
SPIDER_MODULES = ["sitecrawl.spiders"]
ROBOTSTXT_OBEY = False
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
REQUEST_FINGERPRINTER_IMPLEMENTATION = "2.7"
CONCURRENT_REQUESTS_PER_DOMAIN = 8

DOWNLOADER_MIDDLEWARES = {"egress_proxies.scrapy.EgressProxiesMiddleware": 610}
EGRESS_PROXIES_URL = os.environ["EGRESS_PROXIES_URL"]  # grpcs://broker:9090
EGRESS_PROXIES_TOKEN = os.environ.get("EGRESS_PROXIES_TOKEN")
EGRESS_PROXIES_CA_FILE = os.environ.get("EGRESS_PROXIES_CA_FILE")
EGRESS_PROXIES_SELECTOR = {"pool": "crawl"}
