import os

import scrapy


class SiteSpider(scrapy.Spider):
    """Every page of the site: its root and what the root links to."""

    name = "site"

    def start_requests(self):
        yield scrapy.Request(os.environ["SITE_URL"])

    def parse(self, response):
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a::attr(href)")
