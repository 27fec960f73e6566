"""A spider for the middleware's tests: one login session crawls the site."""
import os

import scrapy


class SessionSpider(scrapy.Spider):
    name = "session"

    def start_requests(self):
        yield scrapy.Request(os.environ["SITE_URL"], meta={"egress_session": "login/1"})

    def parse(self, response):
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, meta={"egress_session": "login/1"})


class BroadSpider(scrapy.Spider):
    """Fetches each URL of BROAD_URLS (a file, one per line) once, and says
    what became of it."""
    name = "broad"
    custom_settings = {"RETRY_ENABLED": False, "DOWNLOAD_TIMEOUT": 20, "CONCURRENT_REQUESTS": 16,
                       "CONCURRENT_REQUESTS_PER_DOMAIN": 16}

    def start_requests(self):
        with open(os.environ["BROAD_URLS"]) as f:
            for url in f.read().split():
                yield scrapy.Request(url, errback=self.failed, dont_filter=True, meta={"handle_httpstatus_all": True})

    def parse(self, response):
        yield {"url": response.url, "status": response.status}

    def failed(self, failure):
        yield {"url": failure.request.url, "error": failure.type.__name__}
