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
