"""A Scrapy spider that knows nothing of egress-proxies: it follows the
site's links. The gateway test runs it with only the proxy environment
variables set."""
import scrapy


class SiteSpider(scrapy.Spider):
    name = "plain"

    def __init__(self, start=None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response):
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse)
